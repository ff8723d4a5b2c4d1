"""The one exception type that means "the user asked for something invalid".

The `verify` CLI turns it into a one-line message and a non-zero exit code, without a
traceback. It lives in `theory` because every other package may raise it (imports point
one way: theory <- empirics <- verify).
"""


class UserInputError(ValueError):
    """Bad input from the user: the message names the problem and the fix, in one line."""
