// placeholder: codec_names.cc is being written.
