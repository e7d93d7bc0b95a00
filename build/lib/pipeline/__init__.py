"""Your LM, your corpus, one command: the project's stages as one resumable pipeline (``python -m pipeline``).

:mod:`pipeline.recipe` holds the settings a recipe names, :mod:`pipeline.plan` turns them into the commands that
carry them out, :mod:`pipeline.texts` is the split stage, :mod:`pipeline.report` the report, and
:mod:`pipeline.runner` runs the plan. The stages themselves are the project's commands, unchanged.
"""
