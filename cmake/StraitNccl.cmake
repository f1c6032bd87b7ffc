# NCCL lookup, shared by lib/api (library mode's GPU backend) and bench (strait_nccl_allreduce):
# the nccl.h and libnccl that ship beside the CUDA Toolkit (or wherever STRAIT_NCCL_INCLUDE_DIR /
# STRAIT_NCCL_LIBRARY point). Only where STRAIT_HAVE_CUDA; sets STRAIT_HAVE_NCCL ON when both are
# found, and says so either way. libnccl is linked dynamically (it is the training job's own).
set(STRAIT_HAVE_NCCL OFF)
if(STRAIT_HAVE_CUDA)
  find_package(CUDAToolkit REQUIRED)
  find_path(STRAIT_NCCL_INCLUDE_DIR nccl.h
    HINTS ${CUDAToolkit_INCLUDE_DIRS} ${STRAIT_CUDA_ROOT}/include)
  find_library(STRAIT_NCCL_LIBRARY nccl
    HINTS ${CUDAToolkit_LIBRARY_DIR} ${STRAIT_CUDA_ROOT}/lib64)
  if(STRAIT_NCCL_INCLUDE_DIR AND STRAIT_NCCL_LIBRARY)
    set(STRAIT_HAVE_NCCL ON)
    message(STATUS "Strait: NCCL found (${STRAIT_NCCL_LIBRARY}); library mode's GPU backend "
                   "enabled")
  else()
    message(STATUS "Strait: no nccl.h/libnccl beside the CUDA Toolkit; library mode's GPU backend "
                   "(strait_comm_init_nccl) and strait_nccl_allreduce are not built")
  endif()
endif()
