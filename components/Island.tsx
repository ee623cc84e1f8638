/**
 * Server side of an island: renders the component to HTML inside an
 * `<orchard-island>` marker carrying its props, and records that the page
 * needs the island's script. The client entry hydrates every marker.
 */
import type { ComponentChildren, ComponentType } from "preact";
import { createContext } from "preact";
import { useContext } from "preact/hooks";

/** Collects the islands a page renders (one set per render). */
export const IslandsUsed = createContext<Set<string> | null>(null);

/** Props of `<Island>`. */
export interface IslandProps<P> {
  name: string;
  component: ComponentType<P>;
  props: P;
  children?: ComponentChildren;
}

/** Renders an island (props must be plain JSON). */
export function Island<P>(
  { name, component: C, props }: IslandProps<P>,
) {
  useContext(IslandsUsed)?.add(name);
  return (
    // @ts-ignore: custom element
    <orchard-island data-name={name} data-props={JSON.stringify(props)}>
      {/* @ts-ignore: generic props */}
      <C {...props} />
      {/* @ts-ignore: custom element */}
    </orchard-island>
  );
}
