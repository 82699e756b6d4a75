"""The error a converter raises for a record it cannot convert."""


class ConversionError(ValueError):
    """A raw record that cannot become an interlingua record; the message names the problem."""
