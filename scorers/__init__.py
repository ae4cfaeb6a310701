"""tracescore's scoring pipeline: a Python rendering of Mastra's ``createScorer``.

Pure Python, pydantic and the judge SDKs; imports neither celery nor opentelemetry.
The names (``__init__.pyi``) load on first use.
"""

import lazy_loader

# Each name is imported from its module on first use (the list, which type checkers read too, is
# __init__.pyi): a process that needs one name (the CLI's probes, which Kubernetes runs every few
# seconds) does not pay for the judges' SDKs and every model.
__getattr__, __dir__, __all__ = lazy_loader.attach_stub(__name__, __file__)
