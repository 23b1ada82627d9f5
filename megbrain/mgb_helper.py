"""``mgb_helper``: output callbacks, lazy copies and lazy initializers of shared tensors."""

from .api.callback import (  # noqa: F401
    FuncOutputSaver,
    SharedNDLazyInitializer,
    callback_lazycopy,
    copy_output,
)
