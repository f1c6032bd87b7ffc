# STRAIT_CUDA=AUTO|ON|OFF: decides whether the GPU kernels (lib/cuda) are built.
# AUTO enables CUDA only where a working nvcc is found and says so either way; ON fails the
# configure with a message when it is missing; OFF never looks. CPU-only builds need no CUDA header.
set(STRAIT_CUDA_ROOT "/usr/local/cuda" CACHE PATH "Where AUTO/ON look for nvcc besides PATH")
set(STRAIT_HAVE_CUDA OFF)
if(NOT STRAIT_CUDA MATCHES "^(AUTO|ON|OFF)$")
  message(FATAL_ERROR "STRAIT_CUDA='${STRAIT_CUDA}' is not one of AUTO, ON, OFF.")
endif()
if(NOT STRAIT_CUDA STREQUAL "OFF")
  # Debian's CUDA Toolkit lives outside PATH; look there before check_language searches PATH.
  if(NOT CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX} AND EXISTS ${STRAIT_CUDA_ROOT}/bin/nvcc)
    set(CMAKE_CUDA_COMPILER ${STRAIT_CUDA_ROOT}/bin/nvcc)
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    # Ampere and Hopper machine code plus PTX for newer GPUs, unless the user chose otherwise
    # (enable_language would otherwise pick nvcc's own default).
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES 80-real 90-real 90-virtual CACHE STRING "CUDA architectures")
    endif()
    enable_language(CUDA)
    # CMake 3.25 knows no C++20 flag for nvcc (3.26 does) and CUDA sources take their dialect from
    # CXX_STANDARD (20), so say it; nvcc has accepted -std=c++20 since CUDA 12.0.
    if(NOT DEFINED CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
      set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
      set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
    endif()
    set(STRAIT_HAVE_CUDA ON)
    message(STATUS "Strait: CUDA ${CMAKE_CUDA_COMPILER_VERSION} found; GPU kernels enabled "
                   "(${CMAKE_CUDA_ARCHITECTURES})")
  elseif(STRAIT_CUDA STREQUAL "ON")
    message(FATAL_ERROR "STRAIT_CUDA=ON but no CUDA compiler was found. Install the CUDA Toolkit, "
                        "set CUDACXX=/path/to/nvcc, or configure with -DSTRAIT_CUDA=AUTO or OFF.")
  else()
    message(STATUS "Strait: no CUDA compiler found; building without GPU kernels (STRAIT_CUDA=AUTO)")
  endif()
endif()

# NCCL beside the toolkit (library mode's GPU backend, bench's NCCL program).
include(StraitNccl)
