"""The queue contract between producers (the exporter, backfill) and the workers.

It owns the one request shape (``ScoreRequest``: a trace's span records once, the spans to
score among them — one per run —, the scorer ids, source and job), the batch that is one message
(``ScoreBatch``), its wire format (Celery's task protocol 2 in JSON, built without Celery:
``task_message``; ``request_json``, which writes text no JSON can hold as U+FFFD rather than
fail; ``parse_json``, the parser the worker screens each message with), cutting
requests into messages under the workers' byte cap and the (run, scorer id) pairs a message may
ask for, ``MAX_BATCH_PAIRS`` (``RequestCutter``; a request too large for one is split run by
run, ``ScoreRequest.per_target``, one asking too many pairs by runs), and the one kombu publisher
(``Publisher``; ``QueueKeyError`` when a key it needs on the broker holds another Redis type;
``query_password_problem``, a broker URL it cannot read) with backpressure as a wrapper
(``Backpressure``). The worker validates each message against
``ScoreBatch`` and reads the runs from the span records. A batch id and a task id are plain ids
(``plain_id``; its pattern, ``PLAIN_ID_PATTERN``, which the workers' screen reads its own
sentences back with, and in words, ``PLAIN_ID_RULE``), as Celery and the workers log both as
they are; other text of a producer's is logged as ``shown_id`` shows it.

The names (``__init__.pyi``) load on first use.
"""

import lazy_loader

# Imported from their modules on first use (see __init__.pyi): the workers' settings need one
# constant of this package, not the publisher and the models.
__getattr__, __dir__, __all__ = lazy_loader.attach_stub(__name__, __file__)
