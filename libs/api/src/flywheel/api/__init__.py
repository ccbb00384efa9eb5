"""Flywheel wire contracts: generated protobuf/gRPC code (do not edit: run
`task proto:gen`) and the subject catalogue (subjects.py)."""
