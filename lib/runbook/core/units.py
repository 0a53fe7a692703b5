"""Byte units, defined once. SGLang's logs say "GB" where they divide by 1 << 30: GiB throughout."""

MIB = 1 << 20
GIB = 1 << 30
