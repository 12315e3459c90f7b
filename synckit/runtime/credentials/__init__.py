"""Credentials: the one cipher, sealed tenant config, key rotation, OAuth refresh under a
lease and the connect flow."""
