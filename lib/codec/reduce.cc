// placeholder: reduce.cc is being written.
