// placeholder: kernels_avx2.cc is being written.
