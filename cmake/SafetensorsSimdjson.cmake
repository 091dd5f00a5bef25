# Where simdjson comes from: the target simdjson::simdjson.
#
# By default the system's, found with find_package (Debian's libsimdjson-dev: a shared library, what the
# development build and `pip install .` use). With SAFETENSORS_SIMDJSON_SOURCE naming a directory that holds
# simdjson's single-header amalgamation (simdjson.h and simdjson.cpp, as in simdjson's singleheader/), it is
# compiled here into a static library with hidden symbols instead, so that what links it (the Python wheels of
# scripts/wheel.sh) needs no simdjson at run time and exports none of its symbols. That build is not
# installable: the exported package would name a target no one installs.
set(SAFETENSORS_SIMDJSON_SOURCE "" CACHE PATH
    "Directory with simdjson.h and simdjson.cpp to build simdjson statically from (empty: find_package)")

if(SAFETENSORS_SIMDJSON_SOURCE)
  if(SAFETENSORS_INSTALL)
    message(FATAL_ERROR "SAFETENSORS_SIMDJSON_SOURCE builds simdjson into a private static library, which cannot "
                        "be installed: configure with -DSAFETENSORS_INSTALL=OFF")
  endif()
  if(NOT EXISTS "${SAFETENSORS_SIMDJSON_SOURCE}/simdjson.cpp" OR
     NOT EXISTS "${SAFETENSORS_SIMDJSON_SOURCE}/simdjson.h")
    message(FATAL_ERROR "SAFETENSORS_SIMDJSON_SOURCE=${SAFETENSORS_SIMDJSON_SOURCE} holds no simdjson.cpp and "
                        "simdjson.h")
  endif()
  add_library(safetensors_simdjson STATIC "${SAFETENSORS_SIMDJSON_SOURCE}/simdjson.cpp")
  target_include_directories(safetensors_simdjson SYSTEM PUBLIC "${SAFETENSORS_SIMDJSON_SOURCE}")
  target_compile_features(safetensors_simdjson PUBLIC cxx_std_17)
  set_target_properties(safetensors_simdjson PROPERTIES
    POSITION_INDEPENDENT_CODE ON
    CXX_VISIBILITY_PRESET hidden
    VISIBILITY_INLINES_HIDDEN ON)
  add_library(simdjson::simdjson ALIAS safetensors_simdjson)
else()
  find_package(simdjson REQUIRED)
endif()
