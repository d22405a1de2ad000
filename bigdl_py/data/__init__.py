"""bigdl_py.data"""
