// placeholder: crc32c.cc is being written.
