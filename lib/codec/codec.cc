// placeholder: codec.cc is being written.
