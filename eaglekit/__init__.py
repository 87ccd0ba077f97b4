"""eaglekit: EAGLE-3 speculative decoding. Train a draft, decode losslessly, see inside, interoperate."""

__version__ = "0.1.0"

from .capture import CaptureSpec  # noqa: E402
from .errors import ContractError, EaglekitError, FeatureError, GenerationError, InputError  # noqa: E402

__all__ = ["CaptureSpec", "ContractError", "EaglekitError", "FeatureError", "GenerationError", "InputError"]
