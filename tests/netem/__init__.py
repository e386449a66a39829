"""Network-emulation harness: node and viewer namespaces joined through a router namespace."""
