// placeholder: frame.cc is being written.
