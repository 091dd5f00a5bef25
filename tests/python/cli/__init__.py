"""The ``safetensors`` command-line tool's tests, one module per command (test_inspect, test_verify,
test_convert, test_diff) and test_cli for the tool itself and the checkpoint-path helpers; fixtures in
conftest.py, shared helpers in helpers.py."""
