"""bigdl_py.spark"""
