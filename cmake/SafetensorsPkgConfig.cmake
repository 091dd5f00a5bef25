# What C programs that use safetensors/c.h need to link the C++ library, which a C compiler driver does not
# add on its own: the libraries the C++ compiler links implicitly and the C compiler does not (stdc++ and m
# with GCC). Sets SAFETENSORS_CXX_RUNTIME_LINK_LIBRARIES (a CMake list, for safetensorsConfig.cmake) and
# writes safetensors-c.pc, which unlike safetensors.pc sets no C++ standard flag.
set(SAFETENSORS_CXX_RUNTIME_LIBS "")
set(SAFETENSORS_CXX_RUNTIME_LINK_LIBRARIES "")
foreach(lib IN LISTS CMAKE_CXX_IMPLICIT_LINK_LIBRARIES)
  if(lib IN_LIST CMAKE_C_IMPLICIT_LINK_LIBRARIES)
    continue()
  endif()
  list(APPEND SAFETENSORS_CXX_RUNTIME_LINK_LIBRARIES "${lib}")
  if(IS_ABSOLUTE "${lib}" OR lib MATCHES "^-")
    string(APPEND SAFETENSORS_CXX_RUNTIME_LIBS " ${lib}")
  else()
    string(APPEND SAFETENSORS_CXX_RUNTIME_LIBS " -l${lib}")
  endif()
endforeach()
configure_file(${CMAKE_CURRENT_LIST_DIR}/safetensors-c.pc.in ${PROJECT_BINARY_DIR}/safetensors-c.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/safetensors-c.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
