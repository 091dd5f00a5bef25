"""The installed package is this project's, and it is what `import safetensors` finds."""

import importlib.metadata

import safetensors
from safetensors import _safetensors_cpp


def test_installed_distribution_is_ours():
    assert importlib.metadata.version("safetensors") == safetensors.__version__
    assert "+cpp" in safetensors.__version__
    assert _safetensors_cpp.__name__ == "safetensors._safetensors_cpp"
