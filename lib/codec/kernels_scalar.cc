// placeholder: kernels_scalar.cc is being written.
