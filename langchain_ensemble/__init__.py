"""LangChain adapter for safe-ensemble: ``ChatEnsemble``, several local LLMs answering as one."""

from importlib import metadata

try:
    from .chat_models import ChatEnsemble
except ImportError as err:  # pragma: no cover - only without the extra
    if "langchain_core" in str(err):
        raise ImportError("langchain_ensemble needs langchain-core: pip install -e '.[langchain]' in a clone") from err
    raise

try:
    __version__ = metadata.version("safe-ensemble")
except metadata.PackageNotFoundError:  # pragma: no cover - running from a source tree
    __version__ = ""

__all__ = ["ChatEnsemble", "__version__"]
