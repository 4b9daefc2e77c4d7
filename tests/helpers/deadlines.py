"""The deadlines of the tests' requests."""

#: The deadline of a request whose answer a test waits for, when how fast it comes is not what
#: the test is about: on a loaded machine the client's default (1 s) can pass first, and the
#: daemon then answers TIMEOUT, as it must (docs/testing.md, "The flake hunt").
WAIT = 10.0
