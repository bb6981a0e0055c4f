"""User-facing errors: each one is printed as a single line by the CLI, with a non-zero exit."""


class EdgememError(Exception):
    """A problem the user can act on (bad path, unknown model, corrupt file...).

    The message must be one line and say what went wrong and, where possible, what to do.
    """

    exit_code = 1
