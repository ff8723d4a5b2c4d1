"""The one exception type that means "the user asked for something invalid".

The `verify` CLI turns it into a one-line message and a non-zero exit code, without a
traceback. It lives in the base package `ntkm` because every layer (theory, empirics, verify,
reports) may raise it and imports point one way (docs/DESIGN.md, tests/test_layering.py).
"""


class UserInputError(ValueError):
    """Bad input from the user: the message names the problem and the fix, in one line."""
