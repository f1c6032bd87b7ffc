// placeholder: crc32c_hw.cc is being written.
