// placeholder: kernels_avx512.cc is being written.
