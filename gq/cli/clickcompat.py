"""The click pieces the CLI needs, wherever this typer keeps them.

typer >= 0.29 carries its own copy of click (`typer._click`) and no longer depends on click;
older typers use click itself. Exceptions and ParameterSource must come from the copy typer runs.
"""

from typer import Abort, Exit

try:
    from typer._click import types as click_types
    from typer._click.core import ParameterSource
    from typer._click.exceptions import ClickException, UsageError
except ImportError:  # typer < 0.29
    # The type checker sees the copy above; these are click's own classes of the same names
    # (other types to it, the same API), so each such import is an ignored redefinition.
    from click import types as click_types  # type: ignore[no-redef]
    from click.core import ParameterSource  # type: ignore[assignment]
    from click.exceptions import ClickException, UsageError  # type: ignore[assignment]

__all__ = ["Abort", "ClickException", "Exit", "ParameterSource", "UsageError", "click_types"]
