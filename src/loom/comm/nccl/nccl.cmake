# The comm module with its NCCL backend (included from src/CMakeLists.txt only when
# LOOM_HAS_CUDA). NCCL is found next to the CUDA toolkit or under $NCCL_HOME.
find_package(CUDAToolkit REQUIRED)
find_path(NCCL_INCLUDE_DIR nccl.h HINTS $ENV{NCCL_HOME}/include ${CUDAToolkit_INCLUDE_DIRS})
find_library(NCCL_LIBRARY NAMES nccl HINTS $ENV{NCCL_HOME}/lib ${CUDAToolkit_LIBRARY_DIR}
             ${CUDAToolkit_LIBRARY_ROOT}/lib)
if(NOT NCCL_INCLUDE_DIR OR NOT NCCL_LIBRARY)
  message(FATAL_ERROR "[cmake] LOOM_WITH_CUDA=ON but NCCL was not found; set NCCL_HOME")
endif()
message(STATUS "NCCL: ${NCCL_LIBRARY} (headers ${NCCL_INCLUDE_DIR})")
loom_module(comm DEPS loom_core CUDA::cudart ${NCCL_LIBRARY} EXCLUDE ${LOOM_COMM_MPI_FILES}
            EXTRA_SOURCES ${CMAKE_SOURCE_DIR}/src/loom/comm/nccl/nccl_backend.cpp)
target_include_directories(loom_comm SYSTEM PRIVATE ${NCCL_INCLUDE_DIR})
