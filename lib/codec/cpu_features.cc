// placeholder: cpu_features.cc is being written.
