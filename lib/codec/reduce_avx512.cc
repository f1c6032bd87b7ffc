// placeholder: reduce_avx512.cc is being written.
