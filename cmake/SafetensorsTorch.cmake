# Finds libtorch for the header-only adapter's tests and examples (include/safetensors/libtorch.h).
#
# Only a top-level build that builds tests or examples looks for Torch; the library itself never links it.
# Where no Torch_DIR or CMAKE_PREFIX_PATH points at one, the torch wheel of the project's own virtual
# environment (.venv, made by scripts/setup.sh) is tried, so a plain `cmake -S . -B build` tests the adapter.
# SAFETENSORS_BUILD_LIBTORCH defaults to whether Torch was found; turning it ON makes Torch required.
if(SAFETENSORS_TOP_LEVEL AND (SAFETENSORS_BUILD_TESTS OR SAFETENSORS_BUILD_EXAMPLES))
  if(NOT Torch_DIR)
    file(GLOB _safetensors_venv_torch LIST_DIRECTORIES true
         "${PROJECT_SOURCE_DIR}/.venv/lib/python3*/site-packages/torch/share/cmake/Torch")
  endif()
  find_package(Torch CONFIG QUIET HINTS ${_safetensors_venv_torch})
  unset(_safetensors_venv_torch)
endif()
option(SAFETENSORS_BUILD_LIBTORCH "Build the libtorch adapter's tests and examples" ${Torch_FOUND})
if(SAFETENSORS_BUILD_LIBTORCH AND NOT Torch_FOUND)
  find_package(Torch CONFIG REQUIRED)
endif()
if(SAFETENSORS_BUILD_LIBTORCH)
  message(STATUS "safetensors: libtorch adapter tests and examples enabled (Torch ${Torch_VERSION})")
endif()
