"""The compiled parts of trailbound, the pull's hot paths in C: its row images
(include/trailbound/sources/postgres/_rowjson_c.pyx; rowjson.py does the same without it),
its stream's framing (_reader_c.pyx; reader.py) and its segments' string columns
(include/trailbound/archive/_arrow_c.pyx; writer.py).

`make` builds it in place (`python setup.py build_ext --inplace`, Cython from
requirements.txt). Without Cython, or when the compiler fails, nothing is built and the
pure-Python code runs: the extension is optional, so `pip install -e .` never fails on it.
"""

from setuptools import Extension, setup

try:
    from Cython.Build import cythonize
except ImportError:  # pip's isolated build environment, or a venv without Cython
    extensions = []
else:
    extensions = cythonize([Extension(name, [f"include/{name.replace('.', '/')}.pyx"])
                            for name in ("trailbound.sources.postgres._rowjson_c", "trailbound.sources.postgres._reader_c",
                                         "trailbound.archive._arrow_c")],
                           quiet=True)
    for extension in extensions:
        extension.optional = True  # a compiler that fails leaves the Python (cythonize drops this flag if given to it)

setup(ext_modules=extensions)
