"""`ckptinspect audit`: many repos' reports at once, one row each (the library part).

``select_repos`` turns ids, a file of ids and a Hub listing (huggingface_hub's ``HfApi.list_models``)
into repo refs; ``run_audit`` yields one ``AuditRow`` per repo as it finishes, each read from that repo's
own `report` document (threads, one deadline, a bound on requests in flight, a cache by
commit); ``sort_rows`` puts the usable, fitting quants first; ``gate`` is `--fail-on` for one row.
"""

from ckptinspect.audit.row import AuditRow, RepoError, gate, row_fields, sort_key, sort_rows
from ckptinspect.audit.runner import AuditOptions, run_audit
from ckptinspect.audit.select import RepoRef, Selection, read_ids_file, select_repos

__all__ = ["AuditOptions", "AuditRow", "RepoError", "RepoRef", "Selection", "gate", "read_ids_file",
           "row_fields", "run_audit", "select_repos", "sort_key", "sort_rows"]
