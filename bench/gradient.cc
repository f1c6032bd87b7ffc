// placeholder: being written.
