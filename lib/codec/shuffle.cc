// placeholder: shuffle.cc is being written.
