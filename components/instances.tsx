/**
 * The spanning instances card (fleet/instances.ts), shown on `/nodes`,
 * `/mesh`, `/models` and `/capacity`: each instance's model, state,
 * members (head, memory, transport of the link to it, unmanaged ones) and
 * the nodes that take its requests. Nothing is shown when there are none.
 */
import type { FleetInstance, FleetMember } from "../fleet/instances.ts";
import { Badge, Card, Table } from "./ui.tsx";

function gib(bytes: number | undefined): string {
  return bytes === undefined ? "" : `${(bytes / 2 ** 30).toFixed(1)} GiB`;
}

function Member(props: { m: FleetMember; head: string | null }) {
  const { m } = props;
  const id = m.nodeId ?? m.exoNodeId ?? "?";
  const label = m.name ?? m.hostname ?? m.exoNodeId ?? m.nodeId ?? "?";
  return (
    <li data-member={id}>
      <strong title={label}>{label}</strong>
      {(m.role === "head" || (props.head !== null && props.head === id)) &&
        (
          <>
            <Badge>head</Badge>
          </>
        )}
      {!m.managed && (
        <>
          <Badge tone="warn">unmanaged</Badge>
        </>
      )}
      {m.managed && m.nodeState && m.nodeState !== "healthy" && (
        <>
          <Badge tone="danger">{m.nodeState}</Badge>
        </>
      )}
      {m.memoryBytes !== undefined && (
        <span class="muted">{` ${gib(m.memoryBytes)}`}</span>
      )}
      {m.transport !== undefined && (
        <span class="muted">{` · ${m.transport ?? "link unknown"}`}</span>
      )}
    </li>
  );
}

/** The spanning instances, one row each (none: nothing rendered). */
export function InstancesCard(
  props: { instances: readonly FleetInstance[]; names?: Map<string, string> },
) {
  if (props.instances.length === 0) return null;
  const names = props.names ?? new Map<string, string>();
  return (
    <Card title="Spanning instances" id="instances">
      <p class="sub">
        A model running across several machines is one unit of capacity:
        requests go to the nodes that serve it, and every member counts busy
        while it works.
      </p>
      <Table
        head={["Instance", "State", "Members", "Served by"]}
        rows={props.instances.length}
      >
        {props.instances.map((i) => (
          <tr key={i.id} data-instance={i.id}>
            <td>
              <strong title={i.model}>{i.model}</strong>
              <div class="muted" title={i.id}>{i.id}</div>
              {i.dedicatedTo && <div class="muted">dedicated</div>}
            </td>
            <td>
              <Badge
                tone={i.available
                  ? "ok"
                  : i.state === "degraded"
                  ? "danger"
                  : "warn"}
              >
                {i.available ? i.state : `${i.state}, unavailable`}
              </Badge>
              {i.reason && <div class="muted" title={i.reason}>{i.reason}</div>}
            </td>
            <td>
              <ul class="plain">
                {i.members.map((m) => (
                  <Member
                    key={m.nodeId ?? m.exoNodeId}
                    m={m}
                    head={i.head}
                  />
                ))}
              </ul>
            </td>
            <td>
              {i.serving.length === 0
                ? <span class="muted">none</span>
                : i.serving.map((id) => names.get(id) ?? i.frontNames[id] ?? id)
                  .join(", ")}
              <div class="muted">{i.slots} slots</div>
            </td>
          </tr>
        ))}
      </Table>
    </Card>
  );
}
