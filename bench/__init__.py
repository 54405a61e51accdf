"""The `make bench` harness: batchrun against the seed's naive algorithm and a bare sender."""
