// Unit tests for config parsing and validation live here (see below).
