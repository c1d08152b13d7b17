"""inferwatch node agent: collectors, state, analytics and the API beside an LLM inference runtime."""

import sys

__version__ = "0.1.0"

# httpx imports its optional command-line client (httpx._main: click, rich, pygments) whenever those packages happen
# to be installed, and typer installs them: ~0.25 s of CPU in every process that imports httpx, for a client the
# agent never runs. A None in sys.modules makes that one import fail, and httpx falls back to the stub it uses
# where they are not installed. setdefault: a process that already imported it keeps it.
sys.modules.setdefault("httpx._main", None)  # type: ignore[arg-type]
