// placeholder: error_feedback.cc is being written.
