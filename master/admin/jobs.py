"""The jobs' admin pages."""

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import Q, QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.http import urlencode
from django.utils.safestring import SafeString, mark_safe

from common.admin_ui import HQEInlineBase, JobColumns, pre
from common.errors import FleetshardError
from common.models import HostQueueEntry, Job, Label
from common.syntax import parse_meta_hosts, parse_priority
from master import services
from master.admin.base import SelectFilterMixin, ServiceAdmin, ShardSelectFilter, form_action, only_one
from master.admin.forms import JobCreateForm
from master.blobs.models import Artifact
from master.models import TestRun
from master.results.charts import compare_url
from master.results.queries import result_tests

MAX_OUTPUTS_SHOWN = 200


def blob_url(digest: str, name: str) -> str:
    """A blob's download link (the REST API takes the admin's session), saved under `name`."""
    return f"{reverse('blob', kwargs={'digest': digest})}?{urlencode({'name': name})}"


class JobLabelFilter(SelectFilterMixin, admin.SimpleListFilter):
    """Jobs that name a label, as meta-host or as dependency."""

    title = "label"
    parameter_name = "label"
    select_name = "label"

    def select_choices(self) -> list[tuple[str, str]]:
        return [(str(v), str(d)) for v, d in self.lookup_choices]

    def lookups(self, request: HttpRequest, model_admin: admin.ModelAdmin) -> list[tuple[str, str]]:
        return [(n, n) for n in Label.objects.order_by("name").values_list("name", flat=True)]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Job]) -> QuerySet[Job]:
        name = self.value()
        if not name:
            return queryset
        return queryset.filter(
            Q(id__in=HostQueueEntry.objects.filter(meta_host__name=name).values("job_id"))
            | Q(id__in=Job.dependency_labels.through.objects.filter(label__name=name).values("job_id"))
        )


class HQEInline(HQEInlineBase):
    show_change_link = False

    @admin.display(description="log")
    def log(self, obj: HostQueueEntry) -> SafeString:
        """The log the shard ships, read live by joblog.js; the stored tail until the first bytes come."""
        return format_html(
            '<div class="fs-live-log" id="fs-log-{}" data-url="{}" data-hqe="{}">'
            '<div class="fs-log-note" style="font-size:11px;color:#666"></div>{}</div>',
            obj.id,
            reverse("job-log", kwargs={"id": obj.job_id}),
            obj.id,
            pre(obj.log_tail, lines=40),
        )


def counted(n: int, what: str) -> str:
    many = what[:-1] + "ies" if what.endswith("y") else what + "s"
    return f"{n} {what if n == 1 else many}"


@admin.register(Job)
class JobAdmin(JobColumns, ServiceAdmin):
    # `aborted` is no column: a cross on every normal row read as an error; the status badge says it.
    list_display = ["id", "name", "owner", "priority", "status_badge", "shard", "hqe_count", "created_on"]
    list_display_links = ["id", "name"]
    list_filter = ["status", ("shard", ShardSelectFilter), JobLabelFilter, "aborted"]
    search_fields = ["name", "owner"]
    list_select_related = ["shard"]
    date_hierarchy = None
    readonly_fields = [
        "id",
        "name",
        "owner",
        "status_badge",
        "shard",
        "priority",
        "command_shown",
        "dependency_label_list",
        "keyvals",
        "parent",
        "timeout_mins",
        "max_runtime_mins",
        "aborted_shown",
        "version",
        "rerun_of",
        "created_on",
        "results",
        "timeline",
        "comparison",
        "inputs_shown",
        "outputs",
    ]
    fields = tuple(readonly_fields)
    inlines = [HQEInline]
    actions = ["abort_jobs", "rerun_job"]
    add_form = JobCreateForm
    add_submit = "Submit"

    def create(self, request: HttpRequest, form: forms.Form) -> HttpResponse:
        data = form.cleaned_data
        job = services.create_job(
            services.JobRequest(
                name=data["name"],
                owner=request.user.get_username(),
                command=data["command"],
                meta_hosts=parse_meta_hosts(data["meta_hosts"]),
                hosts=data["hosts"],
                dependency_labels=[label.name for label in data["dependency_labels"]],
                priority=parse_priority(data["priority"]),
                timeout_mins=data["timeout_mins"],
                max_runtime_mins=data["max_runtime_mins"],
                keyvals=data["keyvals"],
            ),
            acting_user=request.user,
        )
        self.message_user(request, f"created job {job.id} ({job.name}) on shard {job.shard}", messages.SUCCESS)
        return HttpResponseRedirect(reverse("admin:common_job_change", args=[job.id]))

    @admin.display(description="results")
    def results(self, obj: Job) -> SafeString:
        """What its runs uploaded, by test, each linked to the test's benchmark charts."""
        tests = result_tests(TestRun.objects.filter(job=obj).only("id", "test", "entry_count"))
        if not tests:
            return format_html("{}", "none")
        return format_html_join(
            ", ",
            '<a href="{}">{}</a> ({}, {})',
            ((t["chart"], t["test"], counted(t["runs"], "run"), counted(t["entries"], "entry")) for t in tests),
        )

    @admin.action(description="Run the selected job again", permissions=["add"])
    def rerun_job(self, request: HttpRequest, queryset: QuerySet[Job]) -> HttpResponse | None:
        job = only_one(self, request, queryset, "job")
        if job is None:
            return None
        try:
            again = services.rerun_job(job.id, owner=request.user.get_username(), acting_user=request.user)
        except FleetshardError as exc:
            self.message_user(request, exc.message, messages.ERROR)
            return None
        self.message_user(request, f"created job {again.id}, a rerun of job {job.id}", messages.SUCCESS)
        return HttpResponseRedirect(reverse("admin:common_job_change", args=[again.id]))

    class Media:
        js = ["master/joblog.js"]

    @admin.display(description="command")
    def command_shown(self, obj: Job) -> SafeString:
        return pre(obj.command)

    @admin.display(description="timeline")
    def timeline(self, obj: Job) -> SafeString:
        url = f"{reverse('timeline-export')}?job={obj.id}&gzip=true"
        return format_html(
            '<a id="fs-timeline-download" href="{}">Download its runs as a trace</a> (Chrome trace)', url
        )

    @admin.display(description="comparison")
    def comparison(self, obj: Job) -> SafeString:
        variants = obj.ab.get("variants", []) if isinstance(obj.ab, dict) else []
        if len(variants) >= 2:
            url = compare_url(f"{obj.id}:{variants[0]}", f"{obj.id}:{variants[1]}")
            return format_html(
                '<a id="fs-job-compare" href="{}">Compare {} against {}</a>', url, variants[1], variants[0]
            )
        return format_html(
            '<a id="fs-job-compare" href="{}">Compare its results with another job\'s</a>', compare_url(str(obj.id))
        )

    @admin.display(description="inputs")
    def inputs_shown(self, obj: Job) -> SafeString:
        items = obj.inputs if isinstance(obj.inputs, list) else []
        return format_html_join(
            mark_safe("<br>"),
            '<a href="{}">{}</a> ({}, {} bytes, sha256 {})',
            ((blob_url(i["digest"], i["name"]), i["name"], i["kind"], i["size"], i["digest"][:12]) for i in items),
        ) or mark_safe("-")

    @admin.display(description="outputs")
    def outputs(self, obj: Job) -> SafeString:
        """The files its runs left in $FLEETSHARD_OUTPUT_DIR, each a download link; skipped ones with why."""
        rows = list(Artifact.objects.filter(hqe__job=obj).order_by("hqe_id", "path")[: MAX_OUTPUTS_SHOWN + 1])
        if not rows:
            return mark_safe("-")
        lines = format_html_join(
            mark_safe("<br>"),
            "{}",
            (
                (
                    format_html(
                        'entry {}: <a href="{}">{}</a> ({} bytes)',
                        a.hqe_id,
                        blob_url(a.digest, a.path.rsplit("/", 1)[-1]),
                        a.path,
                        a.size,
                    )
                    if a.digest
                    else format_html("entry {}: {} (skipped: {})", a.hqe_id, a.path, a.skipped),
                )
                for a in rows[:MAX_OUTPUTS_SHOWN]
            ),
        )
        more = len(rows) > MAX_OUTPUTS_SHOWN
        return format_html("{}{}", lines, f" ... (`fleetshard job artifacts {obj.id}` lists all)" if more else "")

    @admin.display(description="dependency labels")
    def dependency_label_list(self, obj: Job) -> str:
        return ", ".join(label.name for label in obj.dependency_labels.all()) or "-"

    @admin.action(description="Abort selected jobs", permissions=["change"])
    def abort_jobs(self, request: HttpRequest, queryset: QuerySet[Job]) -> TemplateResponse | None:
        def apply(data: dict[str, Any], jobs: list[Job]) -> str:
            ids = sorted(job.id for job in jobs)
            services.abort_jobs(ids, acting_user=request.user)
            listed = ", ".join(map(str, ids))
            return f"aborting job{'s' if len(ids) > 1 else ''} {listed}: their shard stops them at its next heartbeat"

        return form_action(
            self,
            request,
            queryset,
            title="Abort jobs",
            apply=apply,
            submit="Yes, abort them",
            intro="Queued HQEs are cancelled and running ones killed by their shard, which reports them Aborted.",
        )
