"""A task added to the gateway in the tests, as docs/adding-a-task.md describes: one task
module (task.py), one proto (proto/embedding/v1/embedding.proto) and one binding
(binding.py), plugged in through the task registry and the bindings the app takes."""
