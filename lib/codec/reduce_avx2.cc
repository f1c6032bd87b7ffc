// placeholder: reduce_avx2.cc is being written.
