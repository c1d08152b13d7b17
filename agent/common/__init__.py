"""Small pieces shared by the daemon, the doctor, the fleet tools and the command line: value types
(``samples``, ``identity``), secret redaction (``redact``), user-file reading (``userfiles``), the HTTP client
(``httpclient``) and the packaged alert rules and runbooks (``assets``, ``runbooks``)."""
