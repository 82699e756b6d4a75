"""The error a converter raises for a record it cannot convert, and how validation errors read."""

from pydantic import ValidationError


class ConversionError(ValueError):
    """A raw record that cannot become an interlingua record; the message names the problem."""


def summarize_validation(exc: ValidationError) -> str:
    """The first few validation problems as one line: `loc: message; ... (+N more)`."""
    parts = []
    for err in exc.errors()[:3]:
        loc = ".".join(str(p) for p in err["loc"])
        parts.append(f"{loc}: {err['msg']}")
    more = exc.error_count() - len(parts)
    return "; ".join(parts) + (f" (+{more} more)" if more > 0 else "")
