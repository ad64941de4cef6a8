"""Forms of the master's admin. They only parse what a person typed; the services judge it.

So a rule (a label on two shards, an unknown host, a bad name) is checked in one place and an
operator reads the same message in the admin as in the API and the CLI.
"""

import re
from typing import Any

from django import forms

from common.constants import DEFAULT_MAX_RUNTIME_MINS, DEFAULT_TIMEOUT_MINS
from common.models import Label, Shard


def split_names(text: str) -> list[str]:
    """Names separated by spaces, commas or new lines, in order, without repeats."""
    return list(dict.fromkeys(n for n in re.split(r"[\s,]+", text) if n))


class LabelChoiceField(forms.ModelChoiceField):
    def label_from_instance(self, obj: Label) -> str:
        return f"{obj.name} (shard {obj.shard.hostname})" if obj.shard is not None else obj.name


class LabelMultipleChoiceField(forms.ModelMultipleChoiceField):
    widget = forms.SelectMultiple(attrs={"size": 8})

    def label_from_instance(self, obj: Label) -> str:
        return f"{obj.name} (shard {obj.shard.hostname})" if obj.shard is not None else obj.name


def _labels() -> Any:
    return Label.objects.select_related("shard").order_by("name")


class ConfirmForm(forms.Form):
    """An action that only needs a second click."""


class LockForm(forms.Form):
    reason = forms.CharField(
        max_length=1024,
        required=False,
        widget=forms.TextInput(attrs={"size": 70, "autofocus": True}),
        help_text="Why the hosts are locked: everyone who lists them sees it. Locked hosts get no new jobs.",
    )


class LabelForm(forms.Form):
    label = LabelChoiceField(queryset=_labels(), to_field_name="name")

    def __init__(self, *args: Any, queryset: Any = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if queryset is not None:
            self.fields["label"].queryset = queryset  # type: ignore[attr-defined]


class LabelsForm(forms.Form):
    labels = LabelMultipleChoiceField(
        queryset=_labels(),
        to_field_name="name",
        help_text="A label belongs to at most one shard; the shard takes every host that has it.",
    )


class LabelCreateForm(forms.Form):
    names = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 3, "cols": 60}),
        help_text="One or more label names (e.g. board:pixel7), separated by spaces, commas or new lines.",
    )

    def clean_names(self) -> list[str]:
        return split_names(self.cleaned_data["names"])


class HostCreateForm(forms.Form):
    hostnames = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 3, "cols": 60}),
        help_text="One or more hostnames, separated by spaces, commas or new lines.",
    )
    labels = LabelMultipleChoiceField(queryset=_labels(), to_field_name="name", required=False)
    attributes = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 3, "cols": 60}),
        help_text="KEY=VALUE, one per line (e.g. serial=X1); jobs see them as FLEETSHARD_HOST_ATTR_KEY.",
    )
    locked = forms.BooleanField(required=False, help_text="Create the hosts locked (no jobs until unlocked).")
    lock_reason = forms.CharField(max_length=1024, required=False)

    def clean_hostnames(self) -> list[str]:
        return split_names(self.cleaned_data["hostnames"])

    def clean_attributes(self) -> dict[str, str]:
        attributes: dict[str, str] = {}
        for number, line in enumerate(self.cleaned_data["attributes"].splitlines(), 1):
            if not line.strip():
                continue
            key, sep, value = line.partition("=")
            if not sep:
                raise forms.ValidationError(f"line {number}: {line.strip()!r} is not KEY=VALUE")
            attributes[key.strip()] = value.strip()
        return attributes

    def labels_names(self) -> list[str]:
        return [label.name for label in self.cleaned_data["labels"]]


class ShardCreateForm(forms.Form):
    hostname = forms.CharField(
        max_length=255, help_text="The shard's name, as its run_shard sends it (FLEETSHARD_SHARD_HOSTNAME)."
    )
    labels = LabelMultipleChoiceField(
        queryset=_labels(),
        to_field_name="name",
        required=False,
        help_text="Labels the shard owns from the start; more can be added later with an action.",
    )


class TokenCreateForm(forms.Form):
    PERSONAL, SHARD = "personal", "shard"

    kind = forms.ChoiceField(
        choices=[(PERSONAL, "Personal token (REST API and CLI)"), (SHARD, "Shard token (heartbeat)")],
        widget=forms.RadioSelect,
        initial=PERSONAL,
    )
    username = forms.CharField(
        max_length=150, required=False, help_text="Personal token: its user, created if missing."
    )
    admin = forms.BooleanField(
        required=False, help_text="Personal token: make the user staff and superuser (superusers only)."
    )
    shard = forms.ModelChoiceField(
        queryset=Shard.objects.order_by("hostname"),
        to_field_name="hostname",
        required=False,
        help_text="Shard token: an extra heartbeat token for this shard, e.g. to rotate the old one.",
    )
    description = forms.CharField(max_length=255, required=False)

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if data.get("kind") == self.PERSONAL and not data.get("username"):
            self.add_error("username", "a personal token needs a username")
        if data.get("kind") == self.SHARD and not data.get("shard"):
            self.add_error("shard", "a shard token needs a shard")
        return data


class JobCreateForm(forms.Form):
    """A job as `fleetshard job create` takes it: the same syntax for meta-hosts and priority."""

    name = forms.CharField(max_length=255)
    command = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 3, "cols": 80}), help_text="Run with /bin/sh -c on each host."
    )
    meta_hosts = forms.CharField(
        required=False, help_text="LABEL[*N], separated by commas: any N different hosts with LABEL (board:pixel7*2)."
    )
    hosts = forms.CharField(required=False, help_text="Or these hosts, separated by spaces or commas.")
    dependency_labels = LabelMultipleChoiceField(
        queryset=_labels(), to_field_name="name", required=False, help_text="Labels every host needs."
    )
    priority = forms.CharField(initial="default", help_text="low, default, high, super or a number.")
    timeout_mins = forms.IntegerField(
        min_value=1, initial=DEFAULT_TIMEOUT_MINS, help_text="Expire if still queued after."
    )
    max_runtime_mins = forms.IntegerField(min_value=1, initial=DEFAULT_MAX_RUNTIME_MINS, help_text="Kill after.")
    keyvals = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 2, "cols": 60}),
        help_text="KEY=VALUE, one per line; jobs see them as FLEETSHARD_KEYVAL_KEY.",
    )

    def clean_hosts(self) -> list[str]:
        return split_names(self.cleaned_data["hosts"])

    def clean_keyvals(self) -> dict[str, str]:
        keyvals: dict[str, str] = {}
        for number, line in enumerate(self.cleaned_data["keyvals"].splitlines(), 1):
            if not line.strip():
                continue
            key, sep, value = line.partition("=")
            if not sep:
                raise forms.ValidationError(f"line {number}: {line.strip()!r} is not KEY=VALUE")
            keyvals[key.strip()] = value.strip()
        return keyvals
