"""Jobs batchrun runs."""
