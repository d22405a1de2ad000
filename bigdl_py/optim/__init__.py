"""bigdl_py.optim"""
