"""KCL MultiLang applications (amazon-kclpy, Node, Ruby, .NET record processors) run by a shardherd agent, no JVM.

properties.py reads the MultiLangDaemon's `.properties` file; messages.py holds the line-delimited JSON protocol's
messages; child.py runs one processor executable; bridge.py is the RecordProcessor that speaks the protocol with it
for one shard; services/multilang_service.py puts an agent (and by default a coordinator replica) around them.
"""
