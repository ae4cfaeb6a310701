"""Language helpers shared by the code-based scorers: folding, word tokens, stop words.

Stop words come from yake's per-language lists (yake ships one for ~30 languages; the English
one has 574 entries), so ``keyword_coverage`` and ``completeness`` drop the same function words
and one well-kept list is used everywhere. Tokens are Unicode word runs; an inner apostrophe
keeps a contraction whole ("don't" is one token, and a stop word) and a possessive "'s" is cut.
"""

from __future__ import annotations

import functools
import re
import unicodedata

__all__ = ["content_words", "fold", "stop_words", "words"]

_WORD = re.compile(r"[^\W_]+(?:'[^\W_]+)*")
_APOSTROPHES = str.maketrans({"\u2019": "'", "\u2018": "'", "\u02bc": "'"})


def fold(text: str) -> str:
    """Lower-case, decompose, and drop combining marks (``Café`` → ``cafe``)."""
    decomposed = unicodedata.normalize("NFKD", text.translate(_APOSTROPHES))
    return "".join(c for c in decomposed if not unicodedata.combining(c)).lower()


def words(text: str) -> list[str]:
    """The folded word tokens of ``text``, in order, possessive ``'s`` removed."""
    out: list[str] = []
    for token in _WORD.findall(fold(text)):
        if token.endswith("'s") and len(token) > 2:
            token = token[:-2]
        out.append(token)
    return out


@functools.lru_cache(maxsize=8)
def stop_words(language: str) -> frozenset[str]:
    """yake's stop-word list for ``language`` (an ISO 639-1 code such as ``"en"``), folded."""
    import yake  # imported here: it pulls in numpy, which only these scorers need

    extractor = yake.KeywordExtractor(lan=language)
    found = {w for w in getattr(extractor, "stopword_set", ()) if w}
    if len(found) < 10:  # yake falls back to a near-empty "noLang" list for unknown codes
        raise ValueError(
            f"yake has no stop-word list for language {language!r}; "
            "use an ISO 639-1 code such as 'en', 'de', 'fr', 'es'"
        )
    return frozenset(fold(w) for w in found)


def content_words(text: str, language: str, *, keep_numbers: bool) -> list[str]:
    """Distinct non-stop-word tokens of ``text`` in first-seen order."""
    stops = stop_words(language)
    seen: dict[str, None] = {}
    for token in words(text):
        if token in stops or (not keep_numbers and token.isdigit()):
            continue
        seen.setdefault(token, None)
    return list(seen)
