"""bigdl_py.train"""
