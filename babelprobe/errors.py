"""The one exception type for user mistakes.

Anything a researcher can cause (a wrong path, a malformed line, an unknown model) raises
`BabelprobeError` with a one-line message that names the file, field or value and says what to do.
The CLI prints it as `babelprobe: error: ...` and exits with status 2, without a traceback.
Programming errors stay ordinary exceptions so they keep their tracebacks.
"""


class BabelprobeError(Exception):
    """A user-facing error with a one-line explanation."""
