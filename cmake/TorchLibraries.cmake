# The installed PyTorch as imported targets, without find_package(Torch).
#
# find_package(Torch) includes Caffe2's config, which on PyPI's CUDA wheels
# searches for a CUDA toolkit (CUDA_nvrtc_LIBRARY NOTFOUND on a machine
# without one) and links libtorch.so, which pulls in libtorch_cuda. The
# loader needs none of that: it calls c10, ATen and the dispatcher
# (libtorch_cpu, libc10) and pybind11 glue (libtorch_python). So the
# libraries come straight from the torch package that Python imports, and
# the C++ standard is the one torch declares.
#
# Input:  Python3_EXECUTABLE (the interpreter whose torch is built against).
# Output: targets torch::headers (include dirs, C++ ABI, definitions),
#         torch::c10, torch::torch_cpu (both carry torch::headers),
#         torch::torch_python; variables TORCH_VERSION, TORCH_INSTALL_PREFIX
#         (the torch package directory), TORCH_CXX_STANDARD.

include_guard(GLOBAL)

# Autoload off: the build must not import an installed max_device, whose
# extension may be the stale one this build replaces.
execute_process(
  COMMAND "${CMAKE_COMMAND}" -E env TORCH_DEVICE_BACKEND_AUTOLOAD=0 "${Python3_EXECUTABLE}" -c
    "import os, torch, torch.utils; print(torch.__version__); print(torch.utils.cmake_prefix_path); print(int(torch._C._GLIBCXX_USE_CXX11_ABI))"
  OUTPUT_VARIABLE _torch_facts OUTPUT_STRIP_TRAILING_WHITESPACE COMMAND_ERROR_IS_FATAL ANY)
string(REPLACE "\n" ";" _torch_facts "${_torch_facts}")
list(GET _torch_facts 0 TORCH_VERSION)
list(GET _torch_facts 1 _torch_cmake_prefix)
list(GET _torch_facts 2 _torch_cxx11_abi)
# cmake_prefix_path is <torch>/share/cmake.
get_filename_component(TORCH_INSTALL_PREFIX "${_torch_cmake_prefix}/../.." ABSOLUTE)
set(_torch_lib_dir "${TORCH_INSTALL_PREFIX}/lib")

# Compile definitions torch_cpu's consumers get (USE_DISTRIBUTED, ...: they
# shape inline code of torch/csrc headers), from torch's own export file.
file(READ "${_torch_cmake_prefix}/Caffe2/Caffe2Targets.cmake" _torch_targets)
string(REGEX MATCH "set_target_properties\\(torch_cpu PROPERTIES[^)]*" _torch_cpu_props "${_torch_targets}")
set(_torch_definitions "")
if(_torch_cpu_props MATCHES "INTERFACE_COMPILE_DEFINITIONS \"([^\"]*)\"")
  set(_torch_definitions "${CMAKE_MATCH_1}")
endif()

add_library(torch::headers INTERFACE IMPORTED)
set_target_properties(torch::headers PROPERTIES
  INTERFACE_INCLUDE_DIRECTORIES "${TORCH_INSTALL_PREFIX}/include;${TORCH_INSTALL_PREFIX}/include/torch/csrc/api/include"
  INTERFACE_COMPILE_DEFINITIONS "_GLIBCXX_USE_CXX11_ABI=${_torch_cxx11_abi};${_torch_definitions}")

foreach(_lib c10 torch_cpu torch_python)
  find_library(TORCH_${_lib}_LIBRARY ${_lib} PATHS "${_torch_lib_dir}" REQUIRED NO_DEFAULT_PATH)
  add_library(torch::${_lib} SHARED IMPORTED)
  set_target_properties(torch::${_lib} PROPERTIES IMPORTED_LOCATION "${TORCH_${_lib}_LIBRARY}")
endforeach()
set_target_properties(torch::c10 PROPERTIES INTERFACE_LINK_LIBRARIES torch::headers)
set_target_properties(torch::torch_cpu PROPERTIES INTERFACE_LINK_LIBRARIES "torch::c10;torch::headers")
set_target_properties(torch::torch_python PROPERTIES INTERFACE_LINK_LIBRARIES torch::torch_cpu)

# The C++ standard torch declares for its consumers (TorchConfig.cmake sets
# CXX_STANDARD on its target: 20 since 2.13, and 2.14's headers no longer
# compile as C++17); C++17 where it declares none.
file(READ "${_torch_cmake_prefix}/Torch/TorchConfig.cmake" _torch_config)
if(_torch_config MATCHES "CXX_STANDARD ([0-9]+)")
  set(TORCH_CXX_STANDARD "${CMAKE_MATCH_1}")
else()
  set(TORCH_CXX_STANDARD 17)
endif()
message(STATUS "torch ${TORCH_VERSION} at ${TORCH_INSTALL_PREFIX}: C++${TORCH_CXX_STANDARD}, "
               "libraries c10, torch_cpu, torch_python")
